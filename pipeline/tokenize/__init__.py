"""Tokenizing, the fourth room: the stage that trains or loads a byte-level BPE and turns every kept
document into token ids (``stage``), the fast encoding path that gives Hugging Face's ids at tiktoken's
speed (``fast_bpe``), and the Hugging Face files a dataset folder carries so ``AutoTokenizer`` loads it
(``hf_files``)."""
