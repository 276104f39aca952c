"""``python -m experiments.targets.sim``: one replica URL per line, the tier URL, READY."""

from .commands import plain_main

if __name__ == "__main__":
    plain_main(prog_name="python -m experiments.targets.sim")
