"""accel.export"""
