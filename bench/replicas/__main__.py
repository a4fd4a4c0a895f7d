"""`python -m bench.replicas`: the same as `fairgate bench replicas`."""

from bench.replicas.cli import main

main()
