"""accel.calibration: calibration text sources, the stratified sampler, the draw record, token batches."""
from accel.calibration.allocation import allocate, bucket_index, bucket_labels, largest_remainder
from accel.calibration.batches import to_batches, to_padded_batches
from accel.calibration.overlap import OverlapIndex, find_overlaps
from accel.calibration.record import read_draw, write_draw
from accel.calibration.sampler import (CalibrationDraw, DrawnSample, StratumReport, random_draw, stratified_draw,
                                       tokenize)
from accel.calibration.sources import BUILTIN_DIR, TextSample, load_samples

__all__ = [
    "BUILTIN_DIR", "CalibrationDraw", "DrawnSample", "OverlapIndex", "StratumReport", "TextSample", "allocate",
    "bucket_index", "bucket_labels", "find_overlaps", "largest_remainder", "load_samples", "random_draw",
    "read_draw", "stratified_draw", "to_batches", "to_padded_batches", "tokenize", "write_draw",
]
