"""Ingest: raw input objects to UTF-8 documents in part files, bad records quarantined with their reason.

- ``config``: formats by suffix, IngestConfig, and the plan types passed between the stage's steps;
- ``digests``: content digests of the inputs (what unit keys and the build key hold);
- ``streams``: decompression that survives damage, ranged reads, bounded line reading;
- ``encoding``: bytes to ``str`` (BOMs, UTF-8, charset detection);
- ``readers``: one streaming reader per format (txt, jsonl, parquet, and the web archives through ``warc``);
- ``warc``: WARC/WET/ARC records (HTTP headers, transfer and content encodings) to documents;
- ``html``: HTML to text with the extractor a user picks, and a page's charset;
- ``stage``: list the inputs, plan them into parts, run a part.
"""
