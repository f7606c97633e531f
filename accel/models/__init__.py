"""accel.models"""
