"""eyas.serve"""
