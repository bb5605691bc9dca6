module go_alloc

go 1.17
