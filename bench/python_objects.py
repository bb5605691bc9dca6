"""Three functions, each allocating on one known line: 300,000 strings,
100,000 dicts and 5,000 bytearrays of 4 KiB, all kept to the end."""


def strings(n):
    return [str(i) * 3 for i in range(n)]


def dicts(n):
    return [{"k": i} for i in range(n)]


def buffers(n):
    return [bytearray(4096) for _ in range(n)]


def main():
    kept = [strings(300_000), dicts(100_000), buffers(5_000)]
    return sum(len(k) for k in kept)


if __name__ == "__main__":
    main()
