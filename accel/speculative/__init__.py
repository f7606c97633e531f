"""Speculative decoding in the runtime: proposers (n-gram lookup, a draft model, an EAGLE-style feature draft),
verification (greedy prefix match and Leviathan/Chen rejection sampling), adaptive speculation length, the
measured draft cost, acceptance statistics, and `SpeculativeConfig`. Training drafts lives in
`accel.draft_training`; nothing here imports it.
"""
