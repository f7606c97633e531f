"""accel.server"""
