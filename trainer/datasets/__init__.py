"""Dataset generators that write verl-layout parquet files (see synthetic.py).

Nothing is imported here so `python -m trainer.datasets.synthetic` runs without a
double-import warning; import from trainer.datasets.synthetic directly.
"""
