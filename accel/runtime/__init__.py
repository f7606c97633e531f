"""accel.runtime"""
