"""The demo engines (an MLX oracle and a native port with planted defects) and the scenarios they generate."""
