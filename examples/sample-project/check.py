"""Checks the sample shop; exits non-zero on failure."""

import shop

cart = shop.Cart()
cart.add("tea", 2.5)
cart.add("cake", 3.5)
assert cart.total() == 7.2, cart.total()
print("ok: total", cart.total())
