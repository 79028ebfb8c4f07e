"""`python -m maskrcnn_launcher` == `maskrcnn-launch` (for images or venvs without the console script)."""

from maskrcnn_launcher.cli import main

if __name__ == "__main__":
    main(prog_name="maskrcnn-launch")
