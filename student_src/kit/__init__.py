"""What the kit provides: configuration, data, models, process groups, the launcher, the
training loop, timing, traffic measurement and plots. Students read this package; they do
not need to edit it. Their work lives in the modules one level up (train.py, partition.py,
sync.py, ddp.py, profiling.py, bucketed.py)."""
