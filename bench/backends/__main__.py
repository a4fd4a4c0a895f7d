"""`python -m bench.backends`: see `bench.backends.cli`."""

from bench.backends.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
