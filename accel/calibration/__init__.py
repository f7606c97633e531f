"""accel.calibration"""
