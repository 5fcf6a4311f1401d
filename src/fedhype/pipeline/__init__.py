"""The main job: embed → partition → train → synthesize → evaluate → report (``fedhype run``).

The last stage before ``cli``: it imports every earlier stage and nothing imports it but the CLI.
"""
