"""python -m weft.bench: the same as the weft-bench command."""

from weft.bench.cli import run

if __name__ == "__main__":
    run()
