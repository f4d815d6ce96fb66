"""pileworks corpus library: ingest, clean, dedup, tokenize, shard and publish.

Pure Python + numpy/pyarrow/datasketch/tokenizers/boto3. Never imports prefect, torch or deepspeed.
"""

__version__ = "0.1.0"
