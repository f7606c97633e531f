"""accel.quant"""
