"""pileworks trainer: GPT-NeoX-style model, ShardDataset + DistributedSampler, DeepSpeed engine, checkpoints.

Never imports prefect or datasketch; from ``pipeline`` it uses only ``manifest``, ``shards`` and ``storage``.
"""
