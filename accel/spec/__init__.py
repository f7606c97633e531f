"""accel.spec"""
