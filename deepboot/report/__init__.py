"""deepboot.report"""
