"""pileworks corpus library: raw text in, a published dataset of token shards out.

Its rooms, in the order a document meets them (each imports only the rooms before it; tests/test_architecture.py):

- ``storage/``: the object stores every room reads and writes through (local folders, ``s3://``, ``gs://``,
  ``az://``/``abfs[s]://``), retries, ranged reads, the upload journal and its janitor.
- ``units/``: the unit protocol every stage computes in (keys, done records, statistics), proofs, the unit cache
  and the hash ranges of the global steps.
- ``ingest/``: raw files (txt, jsonl, parquet, WARC/WET/ARC) to UTF-8 documents, bad records quarantined.
- ``clean/``: normalisation, boilerplate, the quality rules, language identification, URL rules, PII, the
  quality classifier.
- ``dedup/``: exact and MinHash near-duplicate removal, with its audit.
- ``decontam/``: documents that overlap evaluation sets.
- ``tokenize/``: the byte-level BPE (trained or given), its fast encoding path and its Hugging Face files.
- ``dataset/``: balanced binary shards, the manifest, atomic publishing, verification and the data card.

At the top, only what every room uses: ``errors``, ``config`` (reading config files), ``records`` (documents
and part files), ``sources`` (named, weighted sources and their mixture), and ``corpus_config``, the one config
that names every room's section. Pure Python + numpy/pyarrow/datasketch/tokenizers and the clouds' SDKs (boto3,
google-cloud-storage, azure-storage-blob, each loaded only for a store of its kind), with three small C kernels
in ``clean/`` and one in ``tokenize/``: never imports prefect, torch or deepspeed.
"""

__version__ = "0.1.0"
