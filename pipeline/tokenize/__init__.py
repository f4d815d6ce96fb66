"""Tokenizing, the room before the dataset: the stage that trains or loads a byte-level BPE and turns every
kept document into token ids (``stage``); the ``counts`` trainer, which learns merges from word counts made per part
(``word_counts``: the per-part step; ``bpe_train``: the merges, kernel ``_bpe.c``); the fast encoding path that
gives Hugging Face's ids at tiktoken's speed (``fast_bpe``); and the Hugging Face files a dataset folder carries so
``AutoTokenizer`` loads it (``hf_files``).
"""
