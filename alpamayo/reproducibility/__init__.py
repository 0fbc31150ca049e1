"""What makes two runs of the same inputs give the same bytes: the process set-up that every run gets
(`process`, before torch loads MKL or computes anything) and the `--reproducible` mode (`mode`: the same bytes
on any thread count and worker layout)."""
