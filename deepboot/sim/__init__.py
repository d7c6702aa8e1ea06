"""deepboot.sim"""
