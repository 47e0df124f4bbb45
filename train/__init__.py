"""eyas.train"""
