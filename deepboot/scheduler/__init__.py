"""deepboot.scheduler"""
