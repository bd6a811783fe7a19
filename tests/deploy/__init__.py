"""What ships beside the package: the image, the chart, manifests, rules, dashboards, units."""
