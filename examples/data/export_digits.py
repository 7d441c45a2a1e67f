#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Export the handwritten digits of python3-sklearn to digits.csv.

Run once, by hand (apt-get install python3-sklearn; use the Debian
/usr/bin/python3, which sees that package):

    /usr/bin/python3 examples/data/export_digits.py [OUT]

The CSV is committed so that building and running the example never needs
Python.  Each of the 1797 lines is the label (0-9) followed by the 64 pixel
values (0-16, an 8x8 image row by row), comma-separated, no header: the
UCI "Optical Recognition of Handwritten Digits" test set that sklearn ships
(sklearn.datasets.load_digits), in sklearn's order.
"""
import os
import sys

from sklearn.datasets import load_digits


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "digits.csv")
    d = load_digits()
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        for label, pixels in zip(d.target, d.data):
            # The pixels are small integers stored as floats: write them
            # as integers so the file is exact and compact.
            f.write(",".join([str(int(label))] +
                             [str(int(p)) for p in pixels]) + "\n")
    os.replace(tmp, out)
    print("wrote %s: %d rows of label + %d pixels" %
          (out, len(d.target), d.data.shape[1]))


if __name__ == "__main__":
    main()
