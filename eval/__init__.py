"""eyas.eval"""
