"""accel.report"""
