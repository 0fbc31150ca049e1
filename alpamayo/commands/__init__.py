"""Sub-commands of the `alpamayo` console script (see `alpamayo.cli`)."""
