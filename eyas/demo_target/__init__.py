"""eyas.demo_target"""
