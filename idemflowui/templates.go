package idemflowui

import (
	"fmt"
	"html/template"
)

// pageNames are the pages, each templates/NAME.html defining "content" inside
// templates/layout.html.
var pageNames = []string{"overview", "list", "key", "confirm", "login", "error", "bulk", "cancel"}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("idemflowui: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
