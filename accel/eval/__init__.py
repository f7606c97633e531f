"""accel.eval"""
