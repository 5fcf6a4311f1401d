"""``python -m fedhype``: the same Typer app as the ``fedhype`` console script (:func:`fedhype.cli.main.main`),
for environments where the script's folder is not on ``PATH``."""

from fedhype.cli.main import main

if __name__ == "__main__":
    main()
