"""langrt's child processes: starting, watching and stopping them (`launcher`), and the entry
point each runs (`child`).
"""
