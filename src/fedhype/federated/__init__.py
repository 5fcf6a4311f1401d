"""Stage 4: the in-process federation engine (server ⇄ clients) for FedHypeVAE."""
