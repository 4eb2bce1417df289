"""The main window and the parts it is assembled from: banners, progress, tabs, the investigation's document."""
