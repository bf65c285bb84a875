"""Tools that are clients of the device: `ctl` (admin, as nvme-cli), `stat` (as iostat),
`torture` (crash loops and hostile clients), and the daemon run as a child process for the
other tools and the tests."""
