"""`python -m accel`: the `accel` command."""

from accel.cli import main

main()
