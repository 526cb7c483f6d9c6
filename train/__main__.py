"""`python -m train …` runs the recipe in this process (same arguments as `train/drafter.py`); use
`accelerate launch train/drafter.py …` (or `make train`) for several processes or DeepSpeed."""

from train.drafter import main

raise SystemExit(main())
