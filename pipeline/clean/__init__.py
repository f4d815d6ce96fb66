"""The clean stage: every document repaired, judged and kept or dropped, one part at a time (``stage``:
``clean_batch``, ``run_clean_part``, the steps in the order they run), with each step's rules in a module of its own:

- ``config``: the stage's configs (CleanConfig and those of its steps);
- ``normalize``: text repair (mojibake, control characters, Unicode forms, white space);
- ``boilerplate``: lines repeated across the corpus, counted and removed (kernel ``_lines.c``);
- ``langid``: language identification with py3langid's model (kernel ``_langid_walk.c``);
- ``url``: URL rules (blocklists, banned words) for documents that carry a URL;
- ``quality``: Gopher's document rules and length bounds, over the byte-level word scan of ``wordscan`` (kernel
  ``_wordscan.c``) and the stop-word lists of ``stopwords``;
- ``c4``: C4's line and page rules (off by default);
- ``pii``: e-mail and IP address redaction;
- ``classifier``: a fastText quality classifier's score for every document, ``scores`` the arithmetic of its cut
  and histogram, ``classifier_train`` training one (``pileworks quality train``).
"""
