"""Drafts for speculative decoding, made from the target: EAGLE-style feature drafts (`eagle_train`), small
standalone drafts (`distill`), their prompts, the `accel draft train` command, and offline acceptance analysis.
Uses `accel.speculative` and `accel.runtime`; the runtime never imports this package.
"""
