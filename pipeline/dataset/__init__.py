"""The dataset contract, the last room: balanced binary shards and their ``docs.parquet`` (``shards``), the
manifest training reads (``manifest``), atomic publishing with every object's digest checked and the manifest
last (``publish``), checking a published dataset or a work folder (``verify``), and the data card
(``card``, ``card_markdown``)."""
