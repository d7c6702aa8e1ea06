"""deepboot.cli"""
