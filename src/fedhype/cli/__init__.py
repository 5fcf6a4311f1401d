"""Typer command-line interface (thin: parse, call one function per stage, print)."""
