"""Stage 6 — one command from nothing to an evaluated multilingual bundle (`make all`, `make demo`).

Reads: a pipeline profile (`configs/pipelines/<profile>.yaml`). Writes `runs/<run-id>/` with one
folder per stage, each with a `DONE` record (hash of its config and inputs) so reruns skip finished
work, and `runs/<run-id>/report/`."""
