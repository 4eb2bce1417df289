"""pyqtgraph pieces shared by several plots."""
