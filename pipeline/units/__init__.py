"""Units, what every room computes in: the unit protocol (keys, done records, stage statistics:
``protocol``), the proofs a finished unit carries (``proofs``), the cache that lets a rebuild reuse a unit
another build computed (``cache``), and the hash ranges the global steps split their work by
(``hashranges``)."""
