"""eyas.recipes"""
