"""The operator's page (`dsv4deploy report`): release records, gate and tune reports turned into
static HTML that opens from file:// with no network. Pure: model.py shapes what the records say,
charts.py draws it as inline SVG, page.py renders the templates; the reading and writing is in
cli/report.py."""
