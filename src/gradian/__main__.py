"""``python -m gradian``: the CLI, also what ``torchrun -m gradian ...`` launches on every rank."""

from gradian.cli import main

if __name__ == "__main__":
    main()
