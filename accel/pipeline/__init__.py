"""`accel optimize` as resumable stages: `stages` (keys, manifest, atomic outputs), `optimize` (the stages, gates
and run folder), `evaluate` (the evaluate stage: quality, speed, speculation), `ui` (terminal progress and
summary).
"""
