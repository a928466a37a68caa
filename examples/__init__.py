"""Training scripts written as Horovod elastic scripts with only the import changed: `train.py`
(the smallest) and `digits.py` (what `ringmaster demo` runs). Installed as `ringmaster.examples`
so that the demo finds its script outside a checkout too."""
